from rlstash.cli import main

raise SystemExit(main())
