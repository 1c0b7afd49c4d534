from fencewatch.cli import main

raise SystemExit(main())
