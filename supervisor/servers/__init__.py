"""HTTP model servers as backends (a descriptor with ``http:``): llama-server, vLLM, ComfyUI …

``launch`` fills in a server's macros and picks its port, ``request`` turns a job into the
HTTP request it forwards, and ``handle`` holds :class:`~.handle.ServerHandle`, which presents
a server to the engine with the interface of a worker (``supervisor/workers/base.py``), so
admission, eviction, states, views and events treat it as one.
"""
