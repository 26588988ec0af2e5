"""robusttrain.cornercases"""
