"""Shared fixtures: the devices to run torch tests on (CUDA ones skip without a GPU)."""

import pytest


def cuda_available():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_report_header(config):
    import smla
    lines = ["smla %s (%s) from %s" % (smla.version(), smla.build_features(),
                                       smla.library_path)]
    try:
        import torch
        lines.append("torch %s, cuda available: %s" % (torch.__version__,
                                                       torch.cuda.is_available()))
    except ImportError:
        lines.append("torch: not installed (torch tests skip)")
    return lines


DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(
        not cuda_available(), reason="CUDA tests need torch with a GPU "
        "(torch.cuda.is_available() is False)")),
]
