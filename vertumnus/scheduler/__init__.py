"""Prefill pool scheduler: eligibility, cache-aware placement cost J, reservation (DESIGN.md §1)."""

from vertumnus.scheduler.policy import PlacementCostPolicy, RoutingPolicy, WorkerView
from vertumnus.scheduler.scheduler import RequestRejected, Scheduler
from vertumnus.scheduler.table import Ticket

__all__ = ["PlacementCostPolicy", "RequestRejected", "RoutingPolicy", "Scheduler", "Ticket", "WorkerView"]
