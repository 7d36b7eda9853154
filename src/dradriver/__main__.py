from dradriver.cli.main import main

raise SystemExit(main())
