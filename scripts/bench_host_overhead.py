"""Host time per call of ``wsgemm.matmul`` against ``torch.mm``, interleaved in one process on
64x64 fp16 (see ``wsgemm.bench.host_overhead``); also ``python -m wsgemm bench --host-overhead``.

    python scripts/bench_host_overhead.py [--rounds 7] [--calls 200] [--device cuda]
    python scripts/bench_host_overhead.py --stand-in     # no GPU: wsgemm's Python path alone
"""

import sys

from wsgemm.bench.host_overhead import main

if __name__ == "__main__":
    sys.exit(main())
