"""robusttrain.models"""
