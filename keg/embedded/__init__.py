"""Embedded third-party servers (a real Kafka broker) for development and tests."""
