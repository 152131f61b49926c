"""The studio keeps at most `Limits.max_models` engines in memory, the base one always: walking the
model list cannot grow a server without bound. Engines are stand-ins here (loading is what is counted);
scripts/loadtest.py `models` measures the real server's memory."""

import pytest

import app.studio as studio_module
from app.choices import AUTO, ModelChoice
from app.settings import Limits
from app.studio import Studio
from skipdecode.batcher import Batcher


@pytest.fixture
def studio(monkeypatch):
    loads = []

    class FakeEngine:
        def __init__(self, label):
            self.label = label

    def load(model=None, adapter=None, **_):
        loads.append(adapter or "base")
        return FakeEngine(adapter or "base")

    monkeypatch.setattr(studio_module.Engine, "load", staticmethod(load))
    monkeypatch.setattr(studio_module, "weights_per_token", lambda engine: (1, 0))
    models = [ModelChoice(AUTO), ModelChoice("base", None)] + [ModelChoice(f"a{i}", None, f"a{i}") for i in range(6)]
    s = Studio(models, limits=Limits(max_models=3), batcher=Batcher(window_s=0.0))
    s.loads = loads
    yield s
    s.batcher.close()


def test_walking_every_model_twice_keeps_at_most_max_models_loaded(studio):
    studio.engine("base")
    for _ in range(2):
        for i in range(6):
            assert studio.engine(f"a{i}").label == f"a{i}"
            assert len(studio.loaded) <= 3
            assert "base" in studio.loaded
    assert studio.loads.count("base") == 1  # the base model is never dropped


def test_the_least_recently_used_engine_goes_first(studio):
    for label in ("base", "a0", "a1"):
        studio.engine(label)
    studio.engine("a0")  # a0 is now more recent than a1
    studio.engine("a2")
    assert studio.loaded == ["base", "a0", "a2"]
    studio.engine("a0")
    assert studio.loads.count("a0") == 1  # still loaded: not loaded again


def test_adapters_on_the_shared_4bit_base_all_stay(studio, monkeypatch):
    """On the GGUF's packed 4-bit base an adapter is its LoRA factors beside it (skipdecode/kernels/q4.py): every
    served model stays loaded, and the base is loaded once."""
    from types import SimpleNamespace

    monkeypatch.setattr(studio_module, "shares_base", lambda model, adapter: True)
    load = studio_module.Engine.load

    def shared(*args, **kwargs):
        engine = load(*args, **kwargs)
        engine.decoder = SimpleNamespace(weights=object())
        return engine

    monkeypatch.setattr(studio_module.Engine, "load", staticmethod(shared))
    for label in ("base", *(f"a{i}" for i in range(6))):
        studio.engine(label)
    assert len(studio.loaded) == 7 and studio.loads.count("base") == 1


def test_fewer_than_three_models_is_refused():
    with pytest.raises(ValueError, match="at least 3"):
        Studio([ModelChoice("base", None)], limits=Limits(max_models=2), batcher=Batcher(window_s=0.0))
