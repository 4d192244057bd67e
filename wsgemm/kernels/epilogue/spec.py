"""The compile-time choice of a fused epilogue (plain Python: the host and the compile key read
it without importing the DSL)."""

from __future__ import annotations

from dataclasses import dataclass

#: Where a bias vector runs along: "col" adds ``bias[n]`` to every row (``nn.Linear``'s bias),
#: "row" adds ``bias[m]`` to every column. In the kernel's own (M, N): under swap-AB the host
#: turns the caller's column bias into the transposed problem's row bias (``swapped``).
BIAS_MODES = ("none", "row", "col")
#: The activations, applied in fp32 after the bias: "relu2" is relu(x)², "gelu" the erf form
#: (torch's default), "gelu_tanh" torch's ``approximate="tanh"``, "silu" x·sigmoid(x).
ACTIVATIONS = ("none", "relu", "relu2", "gelu", "gelu_tanh", "silu")


@dataclass(frozen=True)
class Epilogue:
    """``D = act(acc + bias)``: ``bias`` one of ``BIAS_MODES``, ``activation`` one of
    ``ACTIVATIONS``. The default is the plain epilogue (convert and store), whose compiled code
    is the kernel's code before fused epilogues existed."""

    bias: str = "none"
    activation: str = "none"

    def __post_init__(self) -> None:
        if self.bias not in BIAS_MODES:
            raise ValueError(f"bias mode {self.bias!r}; allowed: {', '.join(BIAS_MODES)}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation {self.activation!r}; allowed: {', '.join(ACTIVATIONS)}")

    @property
    def plain(self) -> bool:
        return self.bias == "none" and self.activation == "none"

    @property
    def name(self) -> str:
        """ "none", or the pieces joined by "+" ("bias_col", "bias_col+gelu", "silu"): the form
        compile keys and ``parse`` use."""
        parts = [f"bias_{self.bias}"] if self.bias != "none" else []
        if self.activation != "none":
            parts.append(self.activation)
        return "+".join(parts) or "none"

    @classmethod
    def parse(cls, name: str) -> Epilogue:
        """The epilogue ``name`` names (``Epilogue.parse(e.name) == e``)."""
        if not isinstance(name, str):
            raise TypeError(f"an epilogue name is a str, got {type(name).__name__}")
        bias, activation = "none", "none"
        for part in name.split("+") if name != "none" else ():
            if part.startswith("bias_"):
                bias = part[len("bias_") :]
            else:
                activation = part
        return cls(bias, activation)

    def swapped(self) -> Epilogue:
        """The same epilogue on the transposed problem (swap-AB): rows and columns trade."""
        trade = {"row": "col", "col": "row", "none": "none"}
        return Epilogue(trade[self.bias], self.activation)


PLAIN = Epilogue()
