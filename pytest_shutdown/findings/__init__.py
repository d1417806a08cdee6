"""The findings layer: findings, their text, the warning of warn mode. Imports only ``_base``;
kept empty: importing the warning loads neither the findings nor their text.
"""
