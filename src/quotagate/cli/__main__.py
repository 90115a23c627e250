from quotagate.cli.main import main

main()
