"""The ``aot bench`` driver: the bench models and systems (``suite``), each system in its
own worker process interleaved by a coordinator (``isolated``), the peer systems
(``peers``) and the results pages (``report``). The scripts under the checkout's
``benchmarks/`` use it."""
