"""The catalog: tables, sources, jobs, actors, progress, graphs and workers in Postgres."""
