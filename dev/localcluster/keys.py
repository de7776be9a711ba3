"""The local simulation's keys: labels and annotations only the local cluster and its tests read.

Not part of the product's contract (shared/api/keys.py): no function reads them, no image
carries them, and a real cluster never sees them. They say what a simulated node does, so the
fake kubelet, the node-exporter endpoints and the load benchmark agree on one spelling.
"""

from typing import Final

# The simulated kubelet fault of a Node (or of one pod): how the fake kubelet fails the pods it
# runs there (the modes are in dev/localcluster/podstatus.py).
SIM_FAULT_LABEL: Final = "sim.kn-rescheduler.io/fault"
# "true" on a Node: its fault also breaks the containers already running there (a runtime
# that broke under its pods), not only the pods bound after it.
SIM_FAULT_HITS_RUNNING_LABEL: Final = "sim.kn-rescheduler.io/fault-hits-running"

# Simulated node usage the local node-exporter endpoints serve: fractions 0..1 of the node's
# CPU and memory in use, as annotations on the Node.
SIM_CPU_USAGE_ANNOTATION: Final = "sim.kn-rescheduler.io/cpu-usage"
SIM_MEMORY_USAGE_ANNOTATION: Final = "sim.kn-rescheduler.io/memory-usage"
# What one pod actually uses (cores, bytes), in the load benchmark's usage model: a node's
# simulated usage is its background plus the pods running on it (dev/bench/loadaware.py).
SIM_POD_CPU_ANNOTATION: Final = "sim.kn-rescheduler.io/cpu"
SIM_POD_MEMORY_ANNOTATION: Final = "sim.kn-rescheduler.io/memory"
