"""An in-suite Kubernetes API server for the kubernetes target's tests (docs/decisions/230).

No real API server can run where this suite runs, so this package serves the
custom-objects part of the Kubernetes API on 127.0.0.1 the way a real one
answers it: the CRD from ``deploy/crds/`` decides which group, version,
plural and kind exist and what the objects' schema is; names, labels,
namespaces and apiVersion are validated; list and watch follow label
selectors and a resourceVersion that changes with every write; bearer tokens
and the Role from ``deploy/rbac/`` are enforced; errors come back as the
``Status`` bodies a real server sends. Faults (throttling, 5xx, stalls,
dropped replies) are injected per verb.
"""

from support.kube_api.server import KubeApiServer, running_api_server

__all__ = ["KubeApiServer", "running_api_server"]
