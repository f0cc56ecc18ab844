"""The web dashboard and Prometheus metrics of a homing store (``homing dashboard``).

A face for operators: it reads every part's state through the store's query modules and
imports no other face. Needs ``homing[dashboard]`` (Starlette, Jinja2, prometheus_client).
"""

from homing.dashboard.app import Access, create_app

__all__ = ["Access", "create_app"]
