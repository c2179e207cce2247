"""The software target: the p4src pipeline in Python behind P4Runtime, on real interfaces."""
