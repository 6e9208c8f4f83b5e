"""The dashboard's pages, one module each; every module gives its routes with ``routes(ctx)``."""
