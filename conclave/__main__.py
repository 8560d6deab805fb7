from conclave.cli import main

raise SystemExit(main())
