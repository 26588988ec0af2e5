"""robusttrain.callbacks"""
