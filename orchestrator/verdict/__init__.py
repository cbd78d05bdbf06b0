"""The verdict's statistics: a finalist against the baseline measured beside it (``decide``),
from paired windows and their ratio's interval (``paired``). Import the module you need; this
face imports nothing."""
