"""Generators of docs tables from the code the tests check."""
