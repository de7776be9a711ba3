import sys

from kubectl_kn_rescheduler.cli import main

sys.exit(main())
