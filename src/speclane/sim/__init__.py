"""A discrete-event simulator of lane policies at scale (``speclane simulate``).

It drives the real ``Scheduler`` (and through it the real ``SpecLane``) tick by tick,
with a cost model standing in for the model runner, so policies can be compared on
10,000 requests from 1,000 tenants in seconds. Parts:

- ``workload.py``: seeded arrivals, tenants, priorities, weights, lengths, acceptance;
- ``cost.py``: the cost of a tick as a function of its tokens and verify rows;
- ``acceptance.py``: how many drafts a round accepts (per-request Beta, or scripted);
- ``runner.py``: the fake runner, a ``SchedulerPlan`` in, a ``RunnerResult`` out;
- ``simulator.py``: the event loop (arrivals, schedule, execute, update, clock);
- ``bounds.py``: the lane's bounds (docs/design.md, "The lane, exactly"), measured from outside the lane;
- ``calibrate.py``: fits the cost model from a ``speclane bench`` report;
- ``report.py`` / ``plots.py`` / ``cli.py``: tables, report.md, PNGs, the command.

Nothing here imports torch.
"""
