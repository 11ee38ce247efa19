"""Confinement of untrusted code on this machine: the child that confines itself and the runner that starts it."""
