"""Building blocks the kernel families share: arrive counts checked at trace time (``arrive``),
register and mbarrier budgets (``budget``), the cp.async mbarrier ring (``pipeline``) and the
persistent tile scheduler (``scheduler``). The hardware facts they rest on are in
``wsgemm.support``."""
