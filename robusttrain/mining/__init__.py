"""robusttrain.mining"""
