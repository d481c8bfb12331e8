from icrl.cli import main

main()
