from talkbridge.cli import main

raise SystemExit(main())
