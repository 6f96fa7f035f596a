"""attnlab: experiments with the original Transformer (Vaswani et al., 2017).

Importing the package is cheap: torch and lightning are imported only by the modules that need them,
so configuration errors are reported before the heavy imports start.
"""

from __future__ import annotations

__version__ = "0.1.0"
