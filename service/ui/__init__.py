"""The dashboard under /ui: server-rendered pages (jinja2 templates, local static files, SVG plots), its
sessions, and the posterior summaries that pages and the CLI print.
"""
