"""``kubectl kn-rescheduler``: what kn-rescheduler did, and what it will do, on a live cluster.

What kn-rescheduler knows lives in versioned JSON on workloads and Nodes, and in Events; reading
it by hand means finding the right ReplicaSet and decoding records. This plugin reads them with
the user's kubeconfig and says it in sentences (``status``, ``nodes``), and runs the functions'
own decision code on a live pod (``explain``): the same modules the functions import, not a
second implementation that could drift from them. It writes nothing unless asked: ``cleanup``
lists what it would remove and removes it only with ``--yes``.

One executable, installed by ``pip``/``pipx`` from this package under two names: kubectl finds
``kubectl-kn_rescheduler`` on the PATH (``kubectl kn-rescheduler ...``) and the Knative CLI
finds ``kn-rescheduler`` (``kn rescheduler ...``).
"""
