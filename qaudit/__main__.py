from qaudit.cli import main

main()
