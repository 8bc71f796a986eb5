"""The stages done the PyTorch way: one module per stage, each with a case class per PyTorch variant.
Imported only to measure: they need torch."""

from .adamw import AdamWCase
from .alloc import AllocCase
from .attention import AttentionCase
from .cg import CgCase
from .collate import CollateCase
from .gradnorm import GradNormCase
from .hostsync import HostsyncCase
from .launch import LaunchCase
from .spmv import SpmvCase
from .step import StepCase

CASES = {"adamw": AdamWCase, "gradnorm": GradNormCase, "attention": AttentionCase, "spmv": SpmvCase, "cg": CgCase,
         "hostsync": HostsyncCase, "launch": LaunchCase, "alloc": AllocCase, "collate": CollateCase,
         "step": StepCase}
