"""Tuning: sweep every legal setting of every operator instance and rewrite the profile."""
