"""`relay web` and `/metrics`: the team and its archive in a browser, read through the ledger's
History (never a statement of its own), and the figures a Prometheus scraper reads. server.py
starts it (uvicorn, a fresh token a run), app.py builds the Starlette application (routes, the
token guard, the Content-Security-Policy), pages.py and reads.py the pages (Jinja2 templates in
templates/, CSS and script in static/: nothing from a CDN), live.py the server-sent events,
metrics.py the Prometheus collector, compose.py a person's message (--compose). It needs the
`web` extra (starlette, uvicorn, jinja2, prometheus-client)."""
