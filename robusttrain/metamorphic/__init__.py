"""robusttrain.metamorphic"""
