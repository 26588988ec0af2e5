"""robusttrain.perturbations"""
