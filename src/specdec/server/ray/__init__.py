"""specdec on Ray Serve (``specdec serve --ray``): several engine replicas behind one endpoint.

deployment.py (the replicas and the ingress; imports Ray), app.py (the builder for ``serve run``),
options.py (replica settings and scaling from the serve flags; no Ray import), router.py (the Ray
request router), affinity.py (the conversation-affinity policy), forward.py (in-process ASGI
calls), metrics_merge.py (one Prometheus page over replicas). Only deployment, app and router
import Ray.
"""
