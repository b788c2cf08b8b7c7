"""A rendered service's file and slice are made without a frozen dataclass's __init__
(``core.model.desired.file_spec`` and ``desired_service``: one write to the instance's dict, not
an ``object.__setattr__`` per field). These hold the quick makers to the classes: the same
parameters as the fields, and instances equal in every way to the ones the classes make."""

from __future__ import annotations

import dataclasses
import inspect

from reconciler.core.model import ActionKind, DesiredService, FileSpec, Health, Reload, Rule, Runtime
from reconciler.core.model.desired import desired_service, file_spec


def _same_parameters(maker: object, cls: type) -> None:
    """The maker takes each field of ``cls`` by its name, in order, with the field's default; and
    the class has no ``__post_init__`` (a check there the maker would skip)."""
    assert not hasattr(cls, "__post_init__"), f"{cls.__name__} checks its fields: its quick maker must too"
    params = list(inspect.signature(maker).parameters.values())  # type: ignore[arg-type]
    fields = dataclasses.fields(cls)
    assert [p.name for p in params] == [f.name for f in fields]
    for p, f in zip(params, fields, strict=True):
        if f.default is not dataclasses.MISSING and p.default is not inspect.Parameter.empty:
            assert p.default == f.default, f.name


def test_a_quick_file_spec_is_the_class_s_own_in_every_field() -> None:
    _same_parameters(file_spec, FileSpec)
    for secret, key in ((False, b""), (True, b"k" * 32)):
        made = file_spec("etc/app.conf", 0o640, b"[DEFAULT]\nport = 1\n", secret, key)
        real = FileSpec("etc/app.conf", 0o640, b"[DEFAULT]\nport = 1\n", secret, key)
        assert type(made) is FileSpec
        assert made == real and hash(made) == hash(real)
        assert made.__dict__ == real.__dict__
        assert made.lines == real.lines == ["[DEFAULT]\n", "port = 1\n"]
        assert made.sha256 == real.sha256 and made.to_dict() == real.to_dict()
    assert file_spec("a", 0o644, b"x") == FileSpec("a", 0o644, b"x")


def test_a_quick_slice_is_the_class_s_own_in_every_field_and_hash() -> None:
    _same_parameters(desired_service, DesiredService)
    values = dict(name="api", runtime=Runtime("process", ("api", "--port", "80")),
                  files=(FileSpec("api.conf", 0o644, b"[api]\nport = 80\n"),), health=Health(),
                  depends_on=("db",), drift="report", rules=(Rule("api.conf", ActionKind.RELOAD, ("api.port",)),),
                  reload=Reload("SIGUSR1"), ceiling=ActionKind.RESTART, manual=True, drain="drain", undrain="back")
    made, real = desired_service(**values), DesiredService(**values)  # type: ignore[arg-type]
    assert type(made) is DesiredService
    assert made == real and made.__dict__ == real.__dict__
    assert made.hash == real.hash and made.fingerprint() == real.fingerprint() and made.to_dict() == real.to_dict()
    assert desired_service(**values, origin="abc") == DesiredService(**values, origin="abc")  # type: ignore[arg-type]
    assert dataclasses.replace(made, drift="correct") == dataclasses.replace(real, drift="correct")
