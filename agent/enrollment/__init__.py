"""Enrollment: a device trades a one-time token for its fleet identity (key, certificate,
broker address, trust root); ``edge-agent enroll``."""
