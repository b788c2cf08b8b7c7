"""Importers: a deployment made with another tool turned into a deployment repo of this one
(``reconciler import kolla-ansible``). Beside ``bootstrap``: nothing below imports it."""
