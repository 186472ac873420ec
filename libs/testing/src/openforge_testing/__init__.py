"""Test support for OpenForgeRL: real servers on free ports, service processes.

Installed as a pytest plugin (entry point ``openforge``); never in runtime images.
"""
