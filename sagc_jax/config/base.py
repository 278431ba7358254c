"""The building blocks every config section is declared with (pydantic v2).

* :class:`Section` — a frozen, hashable pydantic model that rejects unknown keys. Direct
  construction (``SAGCConfig(delta=1.5)``) raises :class:`ConfigError` with a one-line message
  naming ``sagc.delta``; ``cfg.model_copy(update={...})`` is the unchecked ``replace`` and
  ``validate()`` re-checks afterwards.
* ``Int`` / ``Float`` / ``Bool`` / ``Str`` — strict scalars: YAML ``1`` is not a bool, ``"3"`` is
  not an int, ``1.5`` is not an int; an int is accepted (and stored) as a float.
* :func:`field` — a default, a doc string and numeric bounds (``gt/ge/lt/le``).
* :func:`rule_error` (re-exported) — raise it from a ``model_validator`` for cross-field rules.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from annotated_types import Ge
from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError

from sagc_jax.config.errors import ConfigError, format_validation_error, rule_error

__all__ = ["Bool", "Float", "Int", "PosInt", "Section", "Str", "field", "rule_error"]

Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]
Bool = Annotated[bool, Strict()]
Str = Annotated[str, Strict()]
PosInt = Annotated[Int, Ge(1)]  # a count of at least one (tuple elements: bounds go here)


def field(default: Any = ..., doc: str = "", **bounds: Any) -> Any:
    """A schema field: default (``...`` = required), doc string and bounds (``ge=1``...).

    Bounds on a tuple field go on its element type instead (``tuple[Annotated[Int, Ge(1)], ...]``)
    so that errors name the item (``sampling.prompt_buckets[0]``).
    """
    return Field(default, description=doc, **bounds)


class _SectionMeta(type(BaseModel)):  # pydantic's ModelMetaclass
    """Direct construction ``Section(...)`` raises ConfigError (one line naming the key).

    Done here rather than in ``__init__``: pydantic validates nested sections through a custom
    ``__init__`` if there is one, and the nested errors must stay pydantic errors (with their
    location) until the root formats them.
    """

    def __call__(cls, *args: Any, **data: Any) -> Any:
        if args:  # positional fields, in ``positional`` order (e.g. RewardSpec("f", 0.5))
            data.update(zip(cls.positional, args, strict=False))  # type: ignore[attr-defined]
        try:
            return super().__call__(**data)
        except ValidationError as e:
            raise ConfigError(format_validation_error(e, cls, cls.section_key)) from None  # type: ignore[attr-defined]


class Section(BaseModel, metaclass=_SectionMeta):
    """Base of every config section: frozen (hashable), unknown keys rejected, one-line errors."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", protected_namespaces=(), allow_inf_nan=False
    )
    # The section's dotted key when it is built or checked on its own ("" = the root).
    section_key: ClassVar[str] = ""
    # Field names that may be given positionally (none by default).
    positional: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_dict(cls, data: Any, key: str | None = None) -> Any:
        """Validate a mapping (missing keys take defaults); errors name ``key``-prefixed keys."""
        key = cls.section_key if key is None else key
        try:
            return cls.model_validate({} if data is None else data)
        except ValidationError as e:
            raise ConfigError(format_validation_error(e, cls, key)) from None

    def validate(self) -> Any:  # type: ignore[override]  # BaseModel.validate is deprecated
        """Check every field and rule again (e.g. after ``model_copy``); returns ``self``."""
        type(self).from_dict(self.model_dump())
        return self
