"""What helps build kn-rescheduler and ships in no image: the local control plane
(localcluster), Knative's data plane run locally (pipeline), the functions run as processes
with the demo (stack), the benchmarks, chaos and soak suites (bench) and the replay tool
(tools). The product is shared/, functions/ and knative/."""
