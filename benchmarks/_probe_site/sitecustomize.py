"""GPU probe instrumentation (not part of cachedb): traces autotune-cache traffic of template
kernels in every process (parent and compile workers) into $PROBE_TRACE as JSON lines."""
import json, os, sys

_PATH = os.environ.get("PROBE_TRACE")


def _w(rec):
    rec["pid"] = os.getpid()
    with open(_PATH, "a") as f:
        f.write(json.dumps(rec, default=str) + "\n")


def _patch(th):
    import torch._inductor.runtime.autotune_cache as ac
    orig_save = ac.AutotuneCache.save
    def save(self, config, time_taken_ns, found_by_coordesc=False, *a, **k):
        _w({"ev": "save", "key": getattr(self, "local_cache", None) and self.local_cache[1], "coordesc": found_by_coordesc, "cfg": str(config)})
        return orig_save(self, config, time_taken_ns, found_by_coordesc, *a, **k)
    ac.AutotuneCache.save = save
    orig_check = th.check_autotune_cache
    def check(configs, filename, inductor_meta):
        out = orig_check(configs, filename, inductor_meta)
        _w({"ev": "check", "kernel": inductor_meta.get("kernel_name"), "file": os.path.basename(filename or ""), "n": len(configs), "coordesc_meta": inductor_meta.get("coordinate_descent_tuning"), "cache": out[1] is not None, "info": out[2]})
        return out
    th.check_autotune_cache = check
    CA = th.CachingAutotuner
    orig_cd = CA.coordinate_descent_tuning
    def cd(self, launcher, *a, **k):
        _w({"ev": "coordesc", "kernel": self.inductor_meta.get("kernel_name"), "file": os.path.basename(self.filename or ""), "hook": self.save_cache_hook is not None, "heur": str(self.heuristic_type), "should": getattr(self, "_should_coordesc_tune", "?"), "start": str(launcher.config), "fbc": getattr(launcher.config, "found_by_coordesc", None)})
        return orig_cd(self, launcher, *a, **k)
    CA.coordinate_descent_tuning = cd


class _Finder:
    name = "torch._inductor.runtime.triton_heuristics"
    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        import importlib.util
        spec = importlib.util.find_spec(fullname)
        loader = spec.loader
        ex = loader.exec_module
        def exec_module(module):
            ex(module)
            try:
                _patch(module)
            except Exception as e:
                _w({"ev": "patch_failed", "err": repr(e)})
        loader.exec_module = exec_module
        return spec


if _PATH:
    sys.meta_path.insert(0, _Finder())
