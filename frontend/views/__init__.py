"""Dashboard views: thin. They parse the request, call frontend.queries, and render a template."""
