"""The HTTP/JSON gateway (``/v1``, SSE, OpenAPI at ``/openapi.json``), built on the asyncio SDK.

:func:`~broker.http.app.create_app` makes the ASGI app; :func:`~broker.http.server.start_in_thread`
runs it beside a node (``raftbroker serve --http``)."""
