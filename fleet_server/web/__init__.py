"""The fleet server's web console: server-rendered pages for fleet operators, line
managers and viewers, served by fleet-server under ``/ui/`` beside the JSON API.

- :mod:`~fleet_server.web.console`: :func:`install_console` puts the pages on the app
  (``install_review_pages`` the decision review pages alone, for the review bench).
- :mod:`~fleet_server.web.pages`: sign-in checks, rendering, errors as pages.
- ``routes_*``: sign-in, fleet overview, device, bundles, rollout and decision review
  pages.
- :mod:`~fleet_server.web.frames`: a decision's boxes drawn over its image (pure).
- :mod:`~fleet_server.web.queries`: the database reads (one query per page section).
- :mod:`~fleet_server.web.health`, :mod:`~fleet_server.web.series`,
  :mod:`~fleet_server.web.gateview`, :mod:`~fleet_server.web.rolloutview`,
  :mod:`~fleet_server.web.rolloutform`: what the pages show, as pure functions.
- :mod:`~fleet_server.web.charts`: server-side SVG charts.

Templates (Jinja2) and the stylesheet and script are files in this package; nothing is
fetched from elsewhere, so the console works on a factory LAN without internet. This
package imports nothing from :mod:`fleet_server.api` at run time (the API's app imports
the console). See docs/web-console.md.
"""
