"""The time contract: triggers and their pure evaluation (spec), parsing of user-written
durations and instants (parse), and formatting for people (fmt)."""
