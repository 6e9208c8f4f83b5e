"""engine: a durable task engine for trio applications, on PostgreSQL."""
