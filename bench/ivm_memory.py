"""The IVM bench's memory figures: tracemalloc bytes per store row, query and subscriber."""

import gc
import tracemalloc


def measure_memory(bench, w1, w2):
    """
    tracemalloc bytes: the store per row; the first query of a shape (it also builds
    the store indexes the shape needs); each further idle query; each subscriber.
    """
    from rindle_app.ivm.catalog import Catalog, FamilyTemplate
    from rindle_app.stream.reader import snapshot

    out = {}
    engine = bench.engine
    n_subs = bench.sizes["mem_subs"]
    for w in (w1, w2):
        if w is None:
            continue
        tables = [engine.tables.get(t) for t in w.TABLES]
        version, rows = snapshot(engine.using, tables)
        n_rows = sum(len(r) for r in rows.values())
        template = FamilyTemplate(w.template)
        subs = [f"m-{w.key}-{i:06d}" for i in range(n_subs)]
        gc.collect()
        tracemalloc.start()
        try:
            m0 = tracemalloc.get_traced_memory()[0]
            catalog = Catalog(engine.tables)
            catalog.load(version, rows)
            gc.collect()
            m1 = tracemalloc.get_traced_memory()[0]
            first = catalog.bind(w.family, template, w.bindings[0])
            gc.collect()
            m2 = tracemalloc.get_traced_memory()[0]
            keys = [first.key] + [
                catalog.bind(w.family, template, b).key
                for b in w.bindings[1 : bench.sizes["mem_queries"]]
            ]
            gc.collect()
            m3 = tracemalloc.get_traced_memory()[0]
            for i, sub in enumerate(subs):
                catalog.attach(keys[i % len(keys)], sub)
            gc.collect()
            m4 = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        footprint = sum(len(catalog.queries[k].view.footprint) for k in keys)
        further = len(keys) - 1
        out[w.key] = {
            "store_rows": n_rows,
            "store_bytes_per_row": (m1 - m0) / n_rows,
            "first_query_bytes_incl_store_indexes": m2 - m1,
            "queries": len(keys),
            "bytes_per_further_idle_query": (m3 - m2) / further if further else None,
            "footprint_rows_per_query": footprint / len(keys),
            "subscribers": n_subs,
            "bytes_per_subscriber": (m4 - m3) / n_subs,
        }
        del catalog
        gc.collect()
    return out
