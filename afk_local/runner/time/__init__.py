"""Durable time: sleeps that park a run, journaled retries, limits shared by a store."""
