"""Integrations on duetime's middleware (docs/integrations.md), each behind its own extra and
imported only by the application that uses it:

    duetime.integrations.otel     OpenTelemetry traces: `duetime[otel]`
    duetime.integrations.sentry   Sentry events: `duetime[sentry]`
"""
