import sys

from kubectl_kn_rescheduler.cli import run

sys.exit(run())
