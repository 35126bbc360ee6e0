from rlstash.train.cli import main

raise SystemExit(main())
